"""This repository's own kernels for the zoo (a regular package, so that `kernels` on sys.path is this one)."""
