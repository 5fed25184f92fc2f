// SGD and LARS on CUDA, the CPU passes of sgd.rs as kernels (arithmetic in double, as there):
// LARS's two squared norms summed into a two-value device buffer, then the momentum buffer and
// the parameter in place, one thread per value. The trust ratio is read from that buffer by every
// thread, so no value goes back to the host.

#define THREADS 256

// d = ratio·(g + λ·w) scales by η‖w‖/‖d‖ where LARS adapts (`sq` the squared norms of w and
// g + λ·w, both positive), else by 1.
__device__ double trust_ratio(const double *sq, double eta) {
    if (sq == nullptr || !(sq[0] > 0.0) || !(sq[1] > 0.0)) return 1.0;
    return eta * sqrt(sq[0]) / sqrt(sq[1]);
}

// sq[0] += Σ w², sq[1] += Σ (g + λ·w)²: each block sums its grid-stride share in shared memory,
// thread 0 adds it with one atomic per norm (sq starts at zero).
template <typename T>
__device__ void squares(double *sq, const T *w, const T *g, long long n, double decay) {
    __shared__ double partial[2][THREADS];
    double w_sq = 0.0, d_sq = 0.0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        double wi = (double)w[i];
        double d = (double)g[i] + decay * wi;
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
        atomicAdd(&sq[0], partial[0][0]);
        atomicAdd(&sq[1], partial[1][0]);
    }
}

// buf ← μ·buf + d.
template <typename T>
__device__ void buffer(T *buf, const T *w, const T *g, long long n, const double *sq,
                       double decay, double momentum, double eta) {
    double ratio = trust_ratio(sq, eta);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        double d = ratio * ((double)g[i] + decay * (double)w[i]);
        buf[i] = (T)(momentum * (double)buf[i] + d);
    }
}

// w ← w − lr·(d + μ·buf) (Nesterov) or w ← w − lr·buf.
template <typename T>
__device__ void weight(T *w, const T *buf, const T *g, long long n, const double *sq,
                       double decay, double momentum, double eta, double lr, int nesterov) {
    double ratio = trust_ratio(sq, eta);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        double wi = (double)w[i];
        double step = (double)buf[i];
        if (nesterov) step = ratio * ((double)g[i] + decay * wi) + momentum * step;
        w[i] = (T)(wi - lr * step);
    }
}

// The `_sgd` kernels step without adapting (no norms); the `_lars` ones read them from `sq`.
#define INSTANTIATE(T, SUFFIX)                                                                   \
    extern "C" __global__ void sgd_squares_##SUFFIX(double *sq, const T *w, const T *g,         \
                                                    long long n, double decay) {                \
        squares<T>(sq, w, g, n, decay);                                                        \
    }                                                                                          \
    extern "C" __global__ void sgd_buffer_##SUFFIX(T *buf, const T *w, const T *g, long long n, \
                                                   double decay, double momentum) {            \
        buffer<T>(buf, w, g, n, nullptr, decay, momentum, 0.0);                                \
    }                                                                                          \
    extern "C" __global__ void lars_buffer_##SUFFIX(T *buf, const T *w, const T *g,             \
                                                    long long n, const double *sq,             \
                                                    double decay, double momentum,             \
                                                    double eta) {                              \
        buffer<T>(buf, w, g, n, sq, decay, momentum, eta);                                     \
    }                                                                                          \
    extern "C" __global__ void sgd_weight_##SUFFIX(T *w, const T *buf, const T *g, long long n, \
                                                   double decay, double momentum, double lr,   \
                                                   int nesterov) {                             \
        weight<T>(w, buf, g, n, nullptr, decay, momentum, 0.0, lr, nesterov);                  \
    }                                                                                          \
    extern "C" __global__ void lars_weight_##SUFFIX(T *w, const T *buf, const T *g,             \
                                                    long long n, const double *sq,             \
                                                    double decay, double momentum, double eta, \
                                                    double lr, int nesterov) {                 \
        weight<T>(w, buf, g, n, sq, decay, momentum, eta, lr, nesterov);                       \
    }

INSTANTIATE(float, f32)
INSTANTIATE(double, f64)
