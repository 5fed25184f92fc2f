// SGD and LARS on CUDA over every parameter of a step (the frame of multi_tensor.cuh), with the
// arithmetic of sgd.rs's CPU passes (in double, the buffer rounded to T before the parameter's
// update reads it): where LARS adapts any parameter, one launch sums the two squared norms of
// each adapting parameter into `sums` (zeros before; two values a parameter), then one launch
// updates every momentum buffer and parameter, reading its trust ratio there, so no value goes
// back to the host.
//
// p = {w, g, buf}; s = {λ, μ, lr, Nesterov (1 or 0), η, adapts (1 or 0)}.

// d = ratio·(g + λ·w) scales by η‖w‖/‖d‖ where LARS adapts (`sq` the squared norms of w and
// g + λ·w, both positive), else by 1.
__device__ double trust_ratio(const double *sq, double eta) {
    if (!(sq[0] > 0.0) || !(sq[1] > 0.0)) return 1.0;
    return eta * sqrt(sq[0]) / sqrt(sq[1]);
}

// sums[2t] += Σ w², sums[2t + 1] += Σ (g + λ·w)² over the block's chunk of an adapting parameter
// t: a tree in shared memory, then one atomic per norm.
template <typename T>
__device__ void squares(const Operands<T> *ops, const Chunk *chunks, long long chunk,
                        double *sums) {
    const Span span = block_span(ops, chunks, chunk);
    const Operands<T> &o = ops[span.t];
    if (o.s[5] == 0.0) return;
    const T *w = o.p[0], *g = o.p[1];
    const T factor = gradient_factor(o);
    const double decay = o.s[0];
    __shared__ double partial[2][THREADS];
    double w_sq = 0.0, d_sq = 0.0;
    for (long long i = span.begin + threadIdx.x; i < span.end; i += blockDim.x) {
        double wi = (double)w[i];
        double d = (double)(g[i] * factor) + decay * wi;
        w_sq += wi * wi;
        d_sq += d * d;
    }
    partial[0][threadIdx.x] = w_sq;
    partial[1][threadIdx.x] = d_sq;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            partial[0][threadIdx.x] += partial[0][threadIdx.x + s];
            partial[1][threadIdx.x] += partial[1][threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        atomicAdd(&sums[2 * span.t], partial[0][0]);
        atomicAdd(&sums[2 * span.t + 1], partial[1][0]);
    }
}

// buf ← μ·buf + d, then w ← w − lr·(d + μ·buf) (Nesterov) or w ← w − lr·buf.
template <typename T>
__device__ void step(const Operands<T> *ops, const Chunk *chunks, long long chunk,
                     const double *sums) {
    const Span span = block_span(ops, chunks, chunk);
    const Operands<T> &o = ops[span.t];
    T *w = o.p[0], *buf = o.p[2];
    const T *g = o.p[1];
    const T factor = gradient_factor(o);
    const double decay = o.s[0], momentum = o.s[1], lr = o.s[2];
    const bool nesterov = o.s[3] != 0.0;
    const double ratio = o.s[5] != 0.0 ? trust_ratio(&sums[2 * span.t], o.s[4]) : 1.0;
    for (long long i = span.begin + threadIdx.x; i < span.end; i += blockDim.x) {
        double wi = (double)w[i];
        double d = ratio * ((double)(g[i] * factor) + decay * wi);
        T bi = (T)(momentum * (double)buf[i] + d);
        buf[i] = bi;
        double s = nesterov ? d + momentum * (double)bi : (double)bi;
        w[i] = (T)(wi - lr * s);
    }
}

#define INSTANTIATE(T, SUFFIX)                                                                  \
    extern "C" __global__ void sgd_squares_##SUFFIX(const Operands<T> *ops,                    \
                                                    const Chunk *chunks, long long chunk,      \
                                                    double *sums) {                            \
        squares<T>(ops, chunks, chunk, sums);                                                 \
    }                                                                                         \
    extern "C" __global__ void sgd_##SUFFIX(const Operands<T> *ops, const Chunk *chunks,       \
                                            long long chunk, double *sums) {                  \
        step<T>(ops, chunks, chunk, sums);                                                    \
    }

INSTANTIATE(float, f32)
INSTANTIATE(double, f64)
