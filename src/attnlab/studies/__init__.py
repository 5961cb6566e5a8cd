"""The lab's studies: experiments about memory and tools rather than attention kernels."""
