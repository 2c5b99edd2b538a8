"""Loss-curve comparison: read training logs, compare them step by step, diagnose where they part."""

# float32 training on two frameworks: different kernels and summation orders move the loss by ~1e-7..1e-5
# relative, while a real bug (learning rate, weight decay, a layer) moves it by 1e-4 or more within a step or two.
DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-6
