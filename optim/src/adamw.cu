// AdamW's update on CUDA over every parameter of a step in one launch (the frame of
// multi_tensor.cuh): the CPU's three passes of adamw.rs fused into one, with the same
// arithmetic (in double, each moment rounded to T before the parameter's update reads it).
//
// p = {w, g, m, v}; s = {β₁, β₂, 1 − lr·λ, lr, 1/(1 − β₁ᵗ), 1/(1 − β₂ᵗ), ε}.

template <typename T>
__device__ void adamw(const Operands<T> *ops, const Chunk *chunks, long long chunk) {
    const Span span = block_span(ops, chunks, chunk);
    const Operands<T> &o = ops[span.t];
    T *w = o.p[0], *m = o.p[2], *v = o.p[3];
    const T *g = o.p[1];
    const T factor = gradient_factor(o);
    const double b1 = o.s[0], b2 = o.s[1], decay = o.s[2], lr = o.s[3], m_scale = o.s[4],
                 v_scale = o.s[5], eps = o.s[6];
    for (long long i = span.begin + threadIdx.x; i < span.end; i += blockDim.x) {
        double gi = (double)(g[i] * factor);
        T mi = (T)(b1 * (double)m[i] + (1.0 - b1) * gi);
        T vi = (T)(b2 * (double)v[i] + (1.0 - b2) * (gi * gi));
        m[i] = mi;
        v[i] = vi;
        double step = (double)mi * m_scale / (sqrt((double)vi * v_scale) + eps);
        w[i] = (T)((double)w[i] * decay - lr * step);
    }
}

#define INSTANTIATE(T, SUFFIX)                                                                  \
    extern "C" __global__ void adamw_##SUFFIX(const Operands<T> *ops, const Chunk *chunks,     \
                                              long long chunk, double *sums) {                \
        adamw<T>(ops, chunks, chunk);                                                         \
    }

INSTANTIATE(float, f32)
INSTANTIATE(double, f64)
