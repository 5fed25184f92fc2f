"""scikit-learn's side of `cargo bench -p ssl-eval --bench linear_probe`.

Reads the features the bench wrote (raw little-endian f32 / u32), standardises them with the
training statistics and fits LogisticRegression(lbfgs, C=1, tol=1e-4, max_iter=1000); prints one
JSON line: median seconds over the repetitions (scaling + fit + predict), accuracy, balanced
accuracy, iterations and the scikit-learn version.
"""
import json
import sys
import time

import numpy as np
import sklearn
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import balanced_accuracy_score
from sklearn.preprocessing import StandardScaler

directory, d, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
train = np.fromfile(f"{directory}/train.f32", dtype="<f4").reshape(-1, d).astype(np.float64)
test = np.fromfile(f"{directory}/test.f32", dtype="<f4").reshape(-1, d).astype(np.float64)
train_y = np.fromfile(f"{directory}/train_y.u32", dtype="<u4")
test_y = np.fromfile(f"{directory}/test_y.u32", dtype="<u4")

seconds = []
for _ in range(reps):
    start = time.perf_counter()
    scaler = StandardScaler().fit(train)
    model = LogisticRegression(C=1.0, solver="lbfgs", tol=1e-4, max_iter=1000)
    model.fit(scaler.transform(train), train_y)
    predictions = model.predict(scaler.transform(test))
    seconds.append(time.perf_counter() - start)

print(json.dumps({
    "seconds": float(np.median(seconds)),
    "accuracy": float(np.mean(predictions == test_y)),
    "balanced_accuracy": float(balanced_accuracy_score(test_y, predictions)),
    "iterations": int(np.max(model.n_iter_)),
    "version": sklearn.__version__,
}))
