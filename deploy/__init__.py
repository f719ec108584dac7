"""Installing the project where no registry is reached: `make wheelhouse` here (wheelhouse.py), then
install.py on the GPU host."""
