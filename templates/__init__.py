"""The kernels tilecarve tunes, each with its reference program, search space and carver template."""
