// The frame of the optimisers' multi-tensor kernels (cuda.rs): one launch steps every parameter.
// A table holds each parameter's buffers (`p`, of the step's type T), the factor its gradient is
// scaled by first (`grad_scale`, a device double; null: none), its value count and its scalars;
// a list of chunks gives each block (parameter, first value) of the CHUNK values it updates.

#define THREADS 256

template <typename T>
struct Operands {
    T *p[4];
    const double *grad_scale;
    long long n;
    double s[7];
};

struct Chunk {
    long long tensor;
    long long start;
};

// This block's chunk: its parameter `t` and the values [begin, end) of it that it updates.
struct Span {
    long long t, begin, end;
};

template <typename T>
__device__ Span block_span(const Operands<T> *ops, const Chunk *chunks, long long chunk) {
    Chunk c = chunks[blockIdx.x];
    long long n = ops[c.tensor].n;
    return Span{c.tensor, c.start, c.start + chunk < n ? c.start + chunk : n};
}

// The factor this parameter's gradient is scaled by, in T as the CPU's `g · factor` takes it (1,
// which changes no value, where there is none).
template <typename T>
__device__ T gradient_factor(const Operands<T> &o) {
    return o.grad_scale == nullptr ? (T)1 : (T)*o.grad_scale;
}
