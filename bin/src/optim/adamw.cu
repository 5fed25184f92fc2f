// AdamW's update on CUDA, the CPU passes of adamw.rs as kernels (arithmetic in double, as there):
// the two moments, then the parameter, each in place, one thread per value.

template <typename T>
__device__ void moment(T *m, const T *g, long long n, double beta, int squared) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        double v = (double)g[i];
        m[i] = (T)(beta * (double)m[i] + (1.0 - beta) * (squared ? v * v : v));
    }
}

template <typename T>
__device__ void update(T *w, const T *m, const T *v, long long n, double decay, double lr,
                       double m_scale, double v_scale, double eps) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        double step = (double)m[i] * m_scale / (sqrt((double)v[i] * v_scale) + eps);
        w[i] = (T)((double)w[i] * decay - lr * step);
    }
}

#define INSTANTIATE(T, SUFFIX)                                                                    \
    extern "C" __global__ void adamw_moment_##SUFFIX(T *m, const T *g, long long n, double beta, \
                                                     int squared) {                             \
        moment<T>(m, g, n, beta, squared);                                                      \
    }                                                                                           \
    extern "C" __global__ void adamw_update_##SUFFIX(T *w, const T *m, const T *v, long long n,  \
                                                     double decay, double lr, double m_scale,   \
                                                     double v_scale, double eps) {              \
        update<T>(w, m, v, n, decay, lr, m_scale, v_scale, eps);                                \
    }

INSTANTIATE(float, f32)
INSTANTIATE(double, f64)
