"""Register budgets of the warp-specialised Hopper kernels (plain numbers: no DSL import).

The producer warpgroup gives its registers to the consumer warpgroups with ``setmaxnreg``;
all warpgroups x 128 threads share the SM's 64K registers.
"""

#: Registers per producer thread after ``setmaxnreg``, by consumer warpgroups.
PRODUCER_REGS = {1: 24, 2: 24, 3: 32}
#: Registers per consumer thread after ``setmaxnreg``, by consumer warpgroups.
CONSUMER_REGS = {1: 240, 2: 240, 3: 160}
