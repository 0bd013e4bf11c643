"""Programs that the MPI and CLI tests start under mpiexec, and the helper that starts them."""
