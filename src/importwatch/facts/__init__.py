"""Facts read from files, never by importing or loading what they describe: ELF, loaded and mapped objects, CUDA, pins."""
