"""jaxnorm experiments: training harness, experiment suite and benchmarks.

Entry point: ``python -m experiments <command> [options]`` with the commands listed in
:mod:`experiments.__main__`. Nothing in :mod:`jaxnorm` imports from here.
"""
