"""Measuring candidates, for dispatch and whole-model tuning alike.

`builder` compiles (candidates with their spec, the compiler default, whole models) and shares
the CPU between compiles and benchmarks; `runner` benchmarks and runs builds behind the `Runner`
interface; `verify` makes inputs and compares outputs; `process` runs the tools; `benchfile`
prepares dumped dispatch benchmarks. Failures are outcomes with a status, never exceptions.
"""
