#!/usr/bin/env python3
"""Checks a run's TensorBoard event files against its metrics.jsonl with TensorBoard's own reader.

    pip install tensorboard
    python tools/tensorboard_check.py RUN/tb RUN/metrics.jsonl

Loads RUN/tb with tensorboard's EventAccumulator (nothing sampled away: size_guidance 0 for every
kind), then checks that every number of every metrics.jsonl record but `step` and `epoch*`
(`null`s skipped) is the event files' scalar of the same tag at the record's step, once, equal
as a float32. The trainer (train/src/runlog.rs) logs an `epoch_end` record, stamped with the steps
taken, at the epoch's last step: `--epoch-end-offset` (default -1) says so. A tag may carry a
`prefix/` (`train/loss` for `loss`). Every image must decode as a PNG of its recorded size
(Pillow, a tensorboard dependency); at least one image is required unless `--no-images-ok`.

A sample run to check: `SSL_TENSORBOARD_SAMPLE=/tmp/tb-sample cargo test --release -p ssl-report --lib
tensorboard::tests::a_killed_and_resumed_run_matches_its_metrics`, then
`python tools/tensorboard_check.py /tmp/tb-sample/tb /tmp/tb-sample/metrics.jsonl`.

Exit status 0 when everything matches, 1 with the mismatches listed otherwise.
"""

import argparse
import io
import json
import math
import sys
from collections import defaultdict

import numpy as np
from tensorboard.backend.event_processing import event_accumulator


def expected_values(metrics_path, epoch_end_offset):
    """{key: {step: value}} of the numbers in metrics.jsonl (a later line for the same key and step wins)."""
    expected = defaultdict(dict)
    with open(metrics_path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            record = json.loads(line)
            step = record["step"] + (epoch_end_offset if "epoch_end" in record else 0)
            for key, value in record.items():
                if key == "step" or key.startswith("epoch"):
                    continue
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue  # null (an absent monitor), strings
                expected[key][step] = float(value)
    return expected


def tag_for(key, tags):
    """The event files' tag for the metrics key `key`: itself, or `prefix/key`."""
    if key in tags:
        return key
    matches = [t for t in tags if t.endswith("/" + key)]
    return matches[0] if len(matches) == 1 else None


def same_f32(stored, value):
    want = float(np.float32(value))
    if math.isnan(want):
        return math.isnan(stored)
    if math.isinf(want):
        return stored == want
    return abs(stored - want) <= 1e-6 * max(1.0, abs(want))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tb_dir", help="the run's TensorBoard directory (RUN/tb)")
    parser.add_argument("metrics", help="the run's metrics.jsonl")
    parser.add_argument("--epoch-end-offset", type=int, default=-1,
                        help="event step minus metrics.jsonl step of epoch_end records (default -1)")
    parser.add_argument("--skip", action="append", default=[], help="a metrics key not to check")
    parser.add_argument("--no-images-ok", action="store_true", help="do not require an image")
    args = parser.parse_args()

    guidance = {kind: 0 for kind in (event_accumulator.COMPRESSED_HISTOGRAMS, event_accumulator.IMAGES,
                                     event_accumulator.AUDIO, event_accumulator.SCALARS,
                                     event_accumulator.HISTOGRAMS, event_accumulator.TENSORS)}
    acc = event_accumulator.EventAccumulator(args.tb_dir, size_guidance=guidance)
    acc.Reload()
    tags = acc.Tags()
    scalar_tags = set(tags[event_accumulator.SCALARS])
    image_tags = tags[event_accumulator.IMAGES]

    problems = []
    checked = 0
    expected = expected_values(args.metrics, args.epoch_end_offset)
    for key, by_step in sorted(expected.items()):
        if key in args.skip:
            continue
        tag = tag_for(key, scalar_tags)
        if tag is None:
            problems.append(f"{key}: no scalar tag {key!r} (or */{key}) in the event files")
            continue
        stored = defaultdict(list)
        for event in acc.Scalars(tag):
            stored[event.step].append(event.value)
        for step, value in sorted(by_step.items()):
            values = stored.get(step, [])
            if len(values) != 1:
                problems.append(f"{tag} at step {step}: {len(values)} values in the event files {values}, "
                                f"metrics.jsonl has {value}")
            elif not same_f32(values[0], value):
                problems.append(f"{tag} at step {step}: event files {values[0]!r}, metrics.jsonl {value!r}")
            checked += 1
        extra = sorted(set(stored) - set(by_step))
        if extra:
            problems.append(f"{tag}: steps {extra[:10]} are in the event files but not in metrics.jsonl")

    images = 0
    try:
        from PIL import Image
    except ImportError:
        Image = None
    for tag in image_tags:
        for event in acc.Images(tag):
            png = event.encoded_image_string
            if not png.startswith(b"\x89PNG\r\n\x1a\n"):
                problems.append(f"image {tag} at step {event.step}: not a PNG")
                continue
            if Image is not None:
                try:
                    picture = Image.open(io.BytesIO(png))
                    picture.load()
                except Exception as e:  # noqa: BLE001 - any decoding failure is the finding
                    problems.append(f"image {tag} at step {event.step}: does not decode: {e}")
                    continue
                if picture.size != (event.width, event.height):
                    problems.append(f"image {tag} at step {event.step}: decodes to {picture.size}, "
                                    f"recorded as {(event.width, event.height)}")
            images += 1
    if images == 0 and not args.no_images_ok:
        problems.append("no images in the event files (--no-images-ok if the run drew none)")

    print(f"{args.tb_dir}: {len(scalar_tags)} scalar tags, {checked} metrics.jsonl values checked; "
          f"{images} images in {len(image_tags)} tags ({', '.join(sorted(image_tags))}) decoded")
    for problem in problems:
        print("MISMATCH", problem)
    print("OK" if not problems else f"FAILED: {len(problems)} problems")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
