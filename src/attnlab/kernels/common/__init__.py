"""Building blocks shared by kernels: layouts, online softmax, masking."""
