// Our CUDA kernels, compiled at run time by NVRTC (see cuda.rs): train-mode batch norm with its
// fused ReLU and its backward, the residual join `relu(h + shortcut)`, max pooling, layer norm,
// softmax and GELU. Each is the CPU op of the same name (batch_norm.rs, residual.rs, …) on the
// GPU: the same formulas, sums in double.
//
// Batch norm grids are (C, S): block (c, s) takes segment s of channel c's row, `seg` values
// long. The statistics kernels write per-segment partial sums; the apply kernels merge the S
// partials of their channel and finish the row segment, so a pass is two launches however many
// channels there are. A channel's M values need not be one run: they lie `inner` at a time,
// every C·inner (`[C, M]` rows: inner = M; activations that lie batch-major, `[N, C, *S]`:
// inner = the positions per sample), and `ChannelWalk` finds them.

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

// Where channel c's values j, j + THREADS, j + 2·THREADS, … lie: value j at
// (j / inner)·C·inner + c·inner + j % inner, stepped without a division.
struct ChannelWalk {
    long long sample, offset, inner, sample_stride, base, step_samples, step_offset;
    __device__ ChannelWalk(long long j, long long c, long long channels, long long inner)
        : sample(j / inner), offset(j % inner), inner(inner), sample_stride(channels * inner),
          base(c * inner), step_samples(THREADS / inner), step_offset(THREADS % inner) {}
    __device__ long long at() const { return sample * sample_stride + base + offset; }
    __device__ void next() {
        sample += step_samples;
        offset += step_offset;
        if (offset >= inner) {
            offset -= inner;
            ++sample;
        }
    }
};

// partial[(c·S + s)·2 + {0, 1}] = Σ x, Σ x² over the segment.
template <typename T>
__device__ void bn_stats(const T *x, double *partial, long long m, long long inner,
                         long long seg) {
    long long c = blockIdx.x, s = blockIdx.y, first = s * seg;
    long long last = first + seg < m ? first + seg : m;
    double sum = 0.0, squares = 0.0;
    ChannelWalk w(first + threadIdx.x, c, gridDim.x, inner);
    for (long long i = first + threadIdx.x; i < last; i += THREADS, w.next()) {
        double v = (double)x[w.at()];
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
                         T *y, double *saved, long long m, long long inner, long long seg,
                         double eps, int relu) {
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
    T k = (T)scale, b = (T)shift, zero = (T)0;
    ChannelWalk w(first + threadIdx.x, c, C, inner);
    for (long long i = first + threadIdx.x; i < last; i += THREADS, w.next()) {
        long long at = w.at();
        T v = x[at] * k + b;
        y[at] = relu && v <= zero ? zero : v;
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
                                 double *partial, long long m, long long inner, long long seg,
                                 int relu) {
    long long c = blockIdx.x, s = blockIdx.y, first = s * seg;
    long long last = first + seg < m ? first + seg : m;
    double mean = saved[c], dbeta = 0.0, dot = 0.0;
    ChannelWalk w(first + threadIdx.x, c, gridDim.x, inner);
    for (long long i = first + threadIdx.x; i < last; i += THREADS, w.next()) {
        long long at = w.at();
        double g = (double)passed(grad[at], res[at], relu);
        dbeta += g;
        dot += g * ((double)x[at] - mean);
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
                                  const double *partial, T *out, long long m, long long inner,
                                  long long seg, int relu) {
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
    ChannelWalk w(first + threadIdx.x, c, C, inner);
    for (long long i = first + threadIdx.x; i < last; i += THREADS, w.next()) {
        long long at = w.at();
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

// Eval-mode batch norm: y = x·s + t (then ReLU) with s = γ/√(var + eps), t = β − mean·s in
// double, channel c = (i / inner) % C of value i (laid out as bn_apply's operands).
template <typename T>
__device__ void bn_eval(const T *x, const T *mean, const T *var, const T *gamma,
                        const T *beta, T *y, long long n, long long channels, long long inner,
                        double eps, int relu) {
    T zero = (T)0;
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < n;
         i += (long long)gridDim.x * THREADS) {
        long long c = (i / inner) % channels;
        double s = (double)gamma[c] / sqrt((double)var[c] + eps);
        double t = (double)beta[c] - (double)mean[c] * s;
        T v = x[i] * (T)s + (T)t;
        y[i] = relu && v <= zero ? zero : v;
    }
}

// out = y + b, `b` (`cols` values) added to every row of `y`: a linear layer's bias after its
// product (linear.rs).
template <typename T>
__device__ void bias_add(const T *y, const T *b, T *out, long long n, long long cols) {
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < n;
         i += (long long)gridDim.x * THREADS) {
        out[i] = y[i] + b[i % cols];
    }
}

#define INSTANTIATE(T, SUFFIX)                                                                    \
    extern "C" __global__ void bn_stats_##SUFFIX(const T *x, double *partial, long long m,      \
                                                 long long inner, long long seg) {              \
        bn_stats<T>(x, partial, m, inner, seg);                                                 \
    }                                                                                           \
    extern "C" __global__ void bn_apply_##SUFFIX(const T *x, const T *gamma, const T *beta,     \
                                                 const double *partial, T *y, double *saved,    \
                                                 long long m, long long inner, long long seg,   \
                                                 double eps, int relu) {                        \
        bn_apply<T>(x, gamma, beta, partial, y, saved, m, inner, seg, eps, relu);               \
    }                                                                                           \
    extern "C" __global__ void bn_running_##SUFFIX(T *running, const double *saved, long long c, \
                                                   long long offset, double factor,             \
                                                   double scale) {                              \
        bn_running<T>(running, saved, c, offset, factor, scale);                                \
    }                                                                                           \
    extern "C" __global__ void bn_backward_sums_##SUFFIX(                                       \
        const T *x, const T *res, const T *grad, const double *saved, double *partial,          \
        long long m, long long inner, long long seg, int relu) {                                \
        bn_backward_sums<T>(x, res, grad, saved, partial, m, inner, seg, relu);                 \
    }                                                                                           \
    extern "C" __global__ void bn_backward_apply_##SUFFIX(                                      \
        const T *x, const T *res, const T *grad, const double *saved, const double *partial,    \
        T *out, long long m, long long inner, long long seg, int relu) {                        \
        bn_backward_apply<T>(x, res, grad, saved, partial, out, m, inner, seg, relu);           \
    }                                                                                           \
    extern "C" __global__ void residual_relu_##SUFFIX(const T *a, const T *b, T *y,             \
                                                      long long n) {                            \
        residual_relu<T>(a, b, y, n);                                                           \
    }                                                                                           \
    extern "C" __global__ void residual_relu_backward_##SUFFIX(const T *y, const T *g, T *dy,   \
                                                               long long n) {                   \
        residual_relu_backward<T>(y, g, dy, n);                                                 \
    }                                                                                           \
    extern "C" __global__ void bn_eval_##SUFFIX(const T *x, const T *mean, const T *var,        \
                                                const T *gamma, const T *beta, T *y,            \
                                                long long n, long long channels,                \
                                                long long inner, double eps, int relu) {        \
        bn_eval<T>(x, mean, var, gamma, beta, y, n, channels, inner, eps, relu);                \
    }                                                                                           \
    extern "C" __global__ void bias_add_##SUFFIX(const T *y, const T *b, T *out, long long n,   \
                                                 long long cols) {                              \
        bias_add<T>(y, b, out, n, cols);                                                        \
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

// Layer norm, softmax over the last axis and the erf GELU, forward and backward: the CPU ops of
// layer_norm.rs, softmax.rs and gelu.rs with the same formulas, sums in double, exponentials
// and erfc in the element type. The row kernels give each row of `k` values one warp
// (THREADS / 32 rows a block, a grid-stride loop over rows); a warp strides over its row, so
// any row length is correct, and rows of up to a few thousand keep every lane busy.

#define WARPS (THREADS / 32)

// The sum over the warp, in every lane.
__device__ double warp_sum(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The largest value over the warp, in every lane (NaNs ignored, as f64::max).
template <typename T>
__device__ T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The rows of the calling warp: `for (long long r = first_row(); r < rows; r += row_step())`,
// the same in every lane, so that the warp's shuffles see all 32 lanes.
__device__ long long first_row() { return blockIdx.x * (long long)WARPS + (threadIdx.x >> 5); }
__device__ long long row_step() { return (long long)gridDim.x * WARPS; }

// y = exp(x − max x) / Σ exp(x − max x) per row of k.
template <typename T>
__device__ void softmax(const T *x, T *y, long long rows, long long k) {
    int lane = threadIdx.x & 31;
    for (long long r = first_row(); r < rows; r += row_step()) {
        const T *in = x + r * k;
        T *out = y + r * k;
        T max = in[0];
        for (long long i = lane; i < k; i += 32) max = fmax(max, in[i]);
        max = warp_max(max);
        double sum = 0.0;
        for (long long i = lane; i < k; i += 32) sum += (double)exp(in[i] - max);
        T inv = (T)(1.0 / warp_sum(sum));
        for (long long i = lane; i < k; i += 32) out[i] = exp(in[i] - max) * inv;
    }
}

// dx = y ⊙ (g − ⟨g, y⟩) per row of k, from the softmax output y and its gradient g.
template <typename T>
__device__ void softmax_backward(const T *y, const T *g, T *dx, long long rows, long long k) {
    int lane = threadIdx.x & 31;
    for (long long r = first_row(); r < rows; r += row_step()) {
        long long at = r * k;
        double dot = 0.0;
        for (long long i = lane; i < k; i += 32) dot += (double)y[at + i] * (double)g[at + i];
        T d = (T)warp_sum(dot);
        for (long long i = lane; i < k; i += 32) dx[at + i] = y[at + i] * (g[at + i] - d);
    }
}

// y = (x − mean)·inv·γ + β per row of d, inv = 1/√(var + eps) with the population variance;
// saved[2r], saved[2r + 1] = the row's mean and inv.
template <typename T>
__device__ void layer_norm(const T *x, const T *gamma, const T *beta, T *y, double *saved,
                           long long rows, long long d, double eps) {
    int lane = threadIdx.x & 31;
    for (long long r = first_row(); r < rows; r += row_step()) {
        const T *in = x + r * d;
        T *out = y + r * d;
        double sum = 0.0;
        for (long long i = lane; i < d; i += 32) sum += (double)in[i];
        double mean = warp_sum(sum) / (double)d, squares = 0.0;
        for (long long i = lane; i < d; i += 32) {
            double c = (double)in[i] - mean;
            squares += c * c;
        }
        double inv = 1.0 / sqrt(warp_sum(squares) / (double)d + eps);
        T mt = (T)mean, it = (T)inv;
        for (long long i = lane; i < d; i += 32) out[i] = (in[i] - mt) * it * gamma[i] + beta[i];
        if (lane == 0) {
            saved[2 * r] = mean;
            saved[2 * r + 1] = inv;
        }
    }
}

// dx = inv·(γ·g − a − (x − mean)·inv·b) per row of d, a = mean(γ·g), b = mean(γ·g·x̂),
// x̂ = (x − mean)·inv.
template <typename T>
__device__ void layer_norm_backward(const T *x, const T *gamma, const T *g, const double *saved,
                                    T *dx, long long rows, long long d) {
    int lane = threadIdx.x & 31;
    for (long long r = first_row(); r < rows; r += row_step()) {
        long long at = r * d;
        double mean = saved[2 * r], inv = saved[2 * r + 1], a = 0.0, b = 0.0;
        for (long long i = lane; i < d; i += 32) {
            double dy = (double)g[at + i] * (double)gamma[i];
            a += dy;
            b += dy * ((double)x[at + i] - mean) * inv;
        }
        T a_t = (T)(warp_sum(a) / (double)d), b_t = (T)(warp_sum(b) / (double)d);
        T mt = (T)mean, it = (T)inv;
        for (long long i = lane; i < d; i += 32)
            dx[at + i] = it * (g[at + i] * gamma[i] - a_t - (x[at + i] - mt) * it * b_t);
    }
}

// Grid (⌈d/32⌉, S): block (c, s) takes columns [32c, 32c + 32) of rows [s·seg, (s + 1)·seg),
// a warp a row at a time, and writes partial[(2s + {0, 1})·d + column] = Σ g·x̂, Σ g.
template <typename T>
__device__ void layer_norm_param_sums(const T *x, const T *g, const double *saved,
                                      double *partial, long long rows, long long d,
                                      long long seg) {
    __shared__ double sg[WARPS][32], sb[WARPS][32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    long long col = blockIdx.x * 32LL + lane, first = blockIdx.y * seg;
    long long last = first + seg < rows ? first + seg : rows;
    double dgamma = 0.0, dbeta = 0.0;
    if (col < d) {
        for (long long r = first + w; r < last; r += WARPS) {
            double gv = (double)g[r * d + col];
            dgamma += gv * ((double)x[r * d + col] - saved[2 * r]) * saved[2 * r + 1];
            dbeta += gv;
        }
    }
    sg[w][lane] = dgamma;
    sb[w][lane] = dbeta;
    __syncthreads();
    if (w == 0 && col < d) {
        for (int k = 1; k < WARPS; ++k) {
            dgamma += sg[k][lane];
            dbeta += sb[k][lane];
        }
        partial[2 * blockIdx.y * d + col] = dgamma;
        partial[(2 * blockIdx.y + 1) * d + col] = dbeta;
    }
}

// out[n + j], out[n + d + j] = dγ, dβ of column j: the sums of its S partials (grid-stride
// over the d columns).
template <typename T>
__device__ void layer_norm_param_merge(const double *partial, T *out, long long n, long long d,
                                       long long segments) {
    for (long long j = blockIdx.x * (long long)THREADS + threadIdx.x; j < d;
         j += (long long)gridDim.x * THREADS) {
        double dgamma = 0.0, dbeta = 0.0;
        for (long long s = 0; s < segments; ++s) {
            dgamma += partial[2 * s * d + j];
            dbeta += partial[(2 * s + 1) * d + j];
        }
        out[n + j] = (T)dgamma;
        out[n + d + j] = (T)dbeta;
    }
}

// y = x·Φ(x), Φ(x) = erfc(−x/√2)/2.
template <typename T>
__device__ void gelu(const T *x, T *y, long long n) {
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < n;
         i += (long long)gridDim.x * THREADS) {
        T v = x[i];
        y[i] = v * ((T)0.5 * erfc(-v * (T)0.70710678118654752440));
    }
}

// dx = g·(Φ(x) + x·φ(x)), φ(x) = exp(−x²/2)/√(2π), with Φ(x) = y/x from the output (1/2 where
// |x| ≤ 10⁻³⁰).
template <typename T>
__device__ void gelu_backward(const T *x, const T *y, const T *g, T *dx, long long n) {
    for (long long i = blockIdx.x * (long long)THREADS + threadIdx.x; i < n;
         i += (long long)gridDim.x * THREADS) {
        T v = x[i];
        T cdf = v > (T)1e-30 || v < (T)-1e-30 ? y[i] / v : (T)0.5;
        T density = exp((T)-0.5 * v * v) * (T)0.39894228040143267794;
        dx[i] = g[i] * (cdf + v * density);
    }
}

#define INSTANTIATE_ROWS(T, SUFFIX)                                                               \
    extern "C" __global__ void softmax_##SUFFIX(const T *x, T *y, long long rows, long long k) { \
        softmax<T>(x, y, rows, k);                                                              \
    }                                                                                           \
    extern "C" __global__ void softmax_backward_##SUFFIX(const T *y, const T *g, T *dx,         \
                                                         long long rows, long long k) {         \
        softmax_backward<T>(y, g, dx, rows, k);                                                 \
    }                                                                                           \
    extern "C" __global__ void layer_norm_##SUFFIX(const T *x, const T *gamma, const T *beta,   \
                                                   T *y, double *saved, long long rows,         \
                                                   long long d, double eps) {                   \
        layer_norm<T>(x, gamma, beta, y, saved, rows, d, eps);                                  \
    }                                                                                           \
    extern "C" __global__ void layer_norm_backward_##SUFFIX(const T *x, const T *gamma,         \
                                                            const T *g, const double *saved,    \
                                                            T *dx, long long rows,              \
                                                            long long d) {                      \
        layer_norm_backward<T>(x, gamma, g, saved, dx, rows, d);                                \
    }                                                                                           \
    extern "C" __global__ void layer_norm_param_sums_##SUFFIX(                                  \
        const T *x, const T *g, const double *saved, double *partial, long long rows,           \
        long long d, long long seg) {                                                           \
        layer_norm_param_sums<T>(x, g, saved, partial, rows, d, seg);                           \
    }                                                                                           \
    extern "C" __global__ void layer_norm_param_merge_##SUFFIX(                                 \
        const double *partial, T *out, long long n, long long d, long long segments) {          \
        layer_norm_param_merge<T>(partial, out, n, d, segments);                                \
    }                                                                                           \
    extern "C" __global__ void gelu_##SUFFIX(const T *x, T *y, long long n) {                   \
        gelu<T>(x, y, n);                                                                       \
    }                                                                                           \
    extern "C" __global__ void gelu_backward_##SUFFIX(const T *x, const T *y, const T *g,       \
                                                      T *dx, long long n) {                     \
        gelu_backward<T>(x, y, g, dx, n);                                                       \
    }

INSTANTIATE_ROWS(float, f32)
INSTANTIATE_ROWS(double, f64)
