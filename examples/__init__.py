"""Example kernels composed by hand from mmaemit's emitters (shipped inside the package as ``mmaemit.examples``)."""
