// Our CUDA kernels, compiled at run time by NVRTC (see cuda.rs): train-mode batch norm with its
// fused ReLU and its backward on channel-major rows `[C, M]`, and the residual join
// `relu(h + shortcut)`. Each is the CPU op of the same name (batch_norm.rs, residual.rs) on the
// GPU: the same formulas, sums in double.
//
// Batch norm grids are (C, S): block (c, s) takes segment s of channel c's row, `seg` values
// long. The statistics kernels write per-segment partial sums; the apply kernels merge the S
// partials of their channel and finish the row segment, so a pass is two launches however many
// channels there are.

#define THREADS 256

// Sums `a` and `b` over the block; thread 0 gets the totals.
__device__ void block_sum2(double &a, double &b) {
    __shared__ double sa[THREADS / 32], sb[THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, o);
        b += __shfl_down_sync(0xffffffffu, b, o);
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sa[warp] = a; sb[warp] = b; }
    __syncthreads();
    if (warp == 0) {
        a = lane < THREADS / 32 ? sa[lane] : 0.0;
        b = lane < THREADS / 32 ? sb[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) {
            a += __shfl_down_sync(0xffffffffu, a, o);
            b += __shfl_down_sync(0xffffffffu, b, o);
        }
    }
}

// partial[(c·S + s)·2 + {0, 1}] = Σ x, Σ x² over the segment.
template <typename T>
__device__ void bn_stats(const T *x, double *partial, long long m, long long seg) {
    long long c = blockIdx.x, s = blockIdx.y, first = s * seg;
    long long last = first + seg < m ? first + seg : m;
    const T *row = x + c * m;
    double sum = 0.0, squares = 0.0;
    for (long long i = first + threadIdx.x; i < last; i += THREADS) {
        double v = (double)row[i];
        sum += v;
        squares += v * v;
    }
    block_sum2(sum, squares);
    if (threadIdx.x == 0) {
        partial[(c * gridDim.y + s) * 2] = sum;
        partial[(c * gridDim.y + s) * 2 + 1] = squares;
    }
}

// y = γ·(x − mean)/√(var + eps) + β (then ReLU), with the population variance; block (c, 0)
// also writes saved = [mean, 1/√(var + eps), γ, var] (4C doubles).
template <typename T>
__device__ void bn_apply(const T *x, const T *gamma, const T *beta, const double *partial,
                         T *y, double *saved, long long m, long long seg, double eps, int relu) {
    __shared__ double scale, shift;
    long long c = blockIdx.x, s = blockIdx.y, C = gridDim.x, first = s * seg;
    long long last = first + seg < m ? first + seg : m;
    if (threadIdx.x == 0) {
        double sum = 0.0, squares = 0.0;
        for (long long k = 0; k < gridDim.y; ++k) {
            sum += partial[(c * gridDim.y + k) * 2];
            squares += partial[(c * gridDim.y + k) * 2 + 1];
        }
        double mean = sum / (double)m;
        double var = squares / (double)m - mean * mean;
        var = var > 0.0 ? var : 0.0;
        double inv = 1.0 / sqrt(var + eps);
        scale = (double)gamma[c] * inv;
        shift = (double)beta[c] - mean * scale;
        if (s == 0) {
            saved[c] = mean;
            saved[C + c] = inv;
            saved[2 * C + c] = (double)gamma[c];
            saved[3 * C + c] = var;
        }
    }
    __syncthreads();
    const T *in = x + c * m;
    T *out = y + c * m;
    T k = (T)scale, b = (T)shift, zero = (T)0;
    for (long long i = first + threadIdx.x; i < last; i += THREADS) {
        T v = in[i] * k + b;
        out[i] = relu && v <= zero ? zero : v;
    }
}

// running ← (1 − factor)·running + factor·scale·saved[offset + c] over the C channels: the
// running mean (offset 0, scale 1) or variance (offset 3C, scale M/(M − 1), unbiased).
template <typename T>
__device__ void bn_running(T *running, const double *saved, long long c, long long offset,
                           double factor, double scale) {
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < c;
         i += (long long)gridDim.x * THREADS) {
        running[i] = (T)((1.0 - factor) * (double)running[i] + factor * scale * saved[offset + i]);
    }
}

// The gradient reaching the norm's output: none where the fused ReLU was off.
template <typename T>
__device__ T passed(T g, T r, int relu) {
    return relu && r <= (T)0 ? (T)0 : g;
}

// partial[(c·S + s)·2 + {0, 1}] = Σ g', Σ g'·(x − mean) over the segment.
template <typename T>
__device__ void bn_backward_sums(const T *x, const T *res, const T *grad, const double *saved,
                                 double *partial, long long m, long long seg, int relu) {
    long long c = blockIdx.x, s = blockIdx.y, first = s * seg;
    long long last = first + seg < m ? first + seg : m;
    double mean = saved[c], dbeta = 0.0, dot = 0.0;
    for (long long i = first + threadIdx.x; i < last; i += THREADS) {
        double g = (double)passed(grad[c * m + i], res[c * m + i], relu);
        dbeta += g;
        dot += g * ((double)x[c * m + i] - mean);
    }
    block_sum2(dbeta, dot);
    if (threadIdx.x == 0) {
        partial[(c * gridDim.y + s) * 2] = dbeta;
        partial[(c * gridDim.y + s) * 2 + 1] = dot;
    }
}

// out = [dx (C·M), dγ (C), dβ (C)]: dx = k·g' + slope·(x − mean) + offset with k = γ·inv,
// slope = −k·inv·dγ/M, offset = −k·dβ/M, dγ = inv·Σ g'·(x − mean), dβ = Σ g'.
template <typename T>
__device__ void bn_backward_apply(const T *x, const T *res, const T *grad, const double *saved,
                                  const double *partial, T *out, long long m, long long seg,
                                  int relu) {
    __shared__ double k, slope, offset;
    long long c = blockIdx.x, s = blockIdx.y, C = gridDim.x, first = s * seg;
    long long last = first + seg < m ? first + seg : m;
    double mean = saved[c];
    if (threadIdx.x == 0) {
        double dbeta = 0.0, dot = 0.0;
        for (long long j = 0; j < gridDim.y; ++j) {
            dbeta += partial[(c * gridDim.y + j) * 2];
            dot += partial[(c * gridDim.y + j) * 2 + 1];
        }
        double inv = saved[C + c], dgamma = inv * dot;
        k = saved[2 * C + c] * inv;
        slope = -k * inv * dgamma / (double)m;
        offset = -k * dbeta / (double)m;
        if (s == 0) {
            out[C * m + c] = (T)dgamma;
            out[C * m + C + c] = (T)dbeta;
        }
    }
    __syncthreads();
    T kt = (T)k, st = (T)slope, ot = (T)offset, mt = (T)mean;
    for (long long i = first + threadIdx.x; i < last; i += THREADS) {
        long long at = c * m + i;
        out[at] = kt * passed(grad[at], res[at], relu) + st * (x[at] - mt) + ot;
    }
}

// y = max(a + b, 0).
template <typename T>
__device__ void residual_relu(const T *a, const T *b, T *y, long long n) {
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < n;
         i += (long long)gridDim.x * THREADS) {
        T v = a[i] + b[i];
        y[i] = v > (T)0 ? v : (T)0;
    }
}

// dy = g · [y > 0].
template <typename T>
__device__ void residual_relu_backward(const T *y, const T *g, T *dy, long long n) {
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < n;
         i += (long long)gridDim.x * THREADS) {
        dy[i] = y[i] > (T)0 ? g[i] : (T)0;
    }
}

#define INSTANTIATE(T, SUFFIX)                                                                    \
    extern "C" __global__ void bn_stats_##SUFFIX(const T *x, double *partial, long long m,      \
                                                 long long seg) {                               \
        bn_stats<T>(x, partial, m, seg);                                                        \
    }                                                                                           \
    extern "C" __global__ void bn_apply_##SUFFIX(const T *x, const T *gamma, const T *beta,     \
                                                 const double *partial, T *y, double *saved,    \
                                                 long long m, long long seg, double eps,        \
                                                 int relu) {                                    \
        bn_apply<T>(x, gamma, beta, partial, y, saved, m, seg, eps, relu);                      \
    }                                                                                           \
    extern "C" __global__ void bn_running_##SUFFIX(T *running, const double *saved, long long c, \
                                                   long long offset, double factor,             \
                                                   double scale) {                              \
        bn_running<T>(running, saved, c, offset, factor, scale);                                \
    }                                                                                           \
    extern "C" __global__ void bn_backward_sums_##SUFFIX(const T *x, const T *res,              \
                                                         const T *grad, const double *saved,    \
                                                         double *partial, long long m,          \
                                                         long long seg, int relu) {             \
        bn_backward_sums<T>(x, res, grad, saved, partial, m, seg, relu);                        \
    }                                                                                           \
    extern "C" __global__ void bn_backward_apply_##SUFFIX(                                      \
        const T *x, const T *res, const T *grad, const double *saved, const double *partial,    \
        T *out, long long m, long long seg, int relu) {                                         \
        bn_backward_apply<T>(x, res, grad, saved, partial, out, m, seg, relu);                  \
    }                                                                                           \
    extern "C" __global__ void residual_relu_##SUFFIX(const T *a, const T *b, T *y,             \
                                                      long long n) {                            \
        residual_relu<T>(a, b, y, n);                                                           \
    }                                                                                           \
    extern "C" __global__ void residual_relu_backward_##SUFFIX(const T *y, const T *g, T *dy,   \
                                                               long long n) {                   \
        residual_relu_backward<T>(y, g, dy, n);                                                 \
    }

INSTANTIATE(float, f32)
INSTANTIATE(double, f64)

// The geometry of a max pooling over `[volumes, D, H, W]`: per axis (d, h, w) the input and
// output extents, the window, stride and padding (`Geom` in conv.rs).
struct PoolGeom {
    int size[3], out[3], k[3], stride[3], pad[3];
};

// y = the maximum of each window, arg = its flat index in the volume: the first maximum in
// (d, h, w) order, a NaN replacing any value (the CPU op's rule).
template <typename T>
__device__ void max_pool(const T *x, T *y, unsigned *arg, long long volumes, PoolGeom g) {
    long long per = (long long)g.out[0] * g.out[1] * g.out[2];
    long long volume = (long long)g.size[0] * g.size[1] * g.size[2];
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < volumes * per;
         i += (long long)gridDim.x * THREADS) {
        long long r = i % per;
        int ow = (int)(r % g.out[2]), oh = (int)(r / g.out[2] % g.out[1]);
        int od = (int)(r / ((long long)g.out[2] * g.out[1]));
        const T *src = x + i / per * volume;
        int d0 = od * g.stride[0] - g.pad[0], h0 = oh * g.stride[1] - g.pad[1];
        int w0 = ow * g.stride[2] - g.pad[2];
        T best = (T)0;
        unsigned at = 0;
        bool any = false;
        for (int d = d0 < 0 ? 0 : d0; d < d0 + g.k[0] && d < g.size[0]; ++d)
            for (int h = h0 < 0 ? 0 : h0; h < h0 + g.k[1] && h < g.size[1]; ++h)
                for (int w = w0 < 0 ? 0 : w0; w < w0 + g.k[2] && w < g.size[2]; ++w) {
                    unsigned idx = ((unsigned)d * g.size[1] + h) * g.size[2] + w;
                    T v = src[idx];
                    if (!any || v > best || v != v) {
                        best = v;
                        at = idx;
                        any = true;
                    }
                }
        y[i] = best;
        arg[i] = at;
    }
}

// dx (zeroed) += each output's gradient at its window's maximum.
template <typename T>
__device__ void max_pool_backward(const T *grad, const unsigned *arg, T *dx, long long volumes,
                                  long long per, long long volume) {
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < volumes * per;
         i += (long long)gridDim.x * THREADS) {
        atomicAdd(dx + i / per * volume + arg[i], grad[i]);
    }
}

#define INSTANTIATE_POOL(T, SUFFIX)                                                               \
    extern "C" __global__ void max_pool_##SUFFIX(const T *x, T *y, unsigned *arg,               \
                                                 long long volumes, PoolGeom g) {               \
        max_pool<T>(x, y, arg, volumes, g);                                                     \
    }                                                                                           \
    extern "C" __global__ void max_pool_backward_##SUFFIX(const T *grad, const unsigned *arg,   \
                                                          T *dx, long long volumes,             \
                                                          long long per, long long volume) {    \
        max_pool_backward<T>(grad, arg, dx, volumes, per, volume);                              \
    }

INSTANTIATE_POOL(float, f32)
INSTANTIATE_POOL(double, f64)
