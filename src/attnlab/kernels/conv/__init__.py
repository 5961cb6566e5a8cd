"""The lab's convolution-family kernels (``attnlab.conv`` calls them)."""
