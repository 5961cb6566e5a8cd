"""Explaining compiled kernels from their artifacts (cubin/PTX) and profiles; never imports
kernel code.

One module per question, each a few plain functions over frozen dataclasses with ``to_dict()``
(the CLI prints them as tables or JSON).

Static (build time, no GPU):

* ``sass``: disassembly, static opcode histograms, instruction groups, ``useful_pct``, the
  seeds' SASS evidence (address registers, copies feeding HMMA, CS2R) and report diffs.
* ``control_codes``: the scheduling bits of each instruction (stall, yield, barriers, reuse).
* ``resources``: registers, stack, spills and shared memory of a cubin.
* ``occupancy``: CTAs per SM on built-in GPU specs or the current device, limits and cliffs.
* ``banks``: a static shared-memory bank-conflict model, also applied to a ``FlashConfig``.

Measured (GPU): ``ncu`` (Nsight Compute metrics) and ``roofline``.

``tools`` locates the NVIDIA binaries (``nvdisasm``, ``cuobjdump``, ``ncu``).
"""
