"""Training back ends: they adapt the backend-free reward objects to verl (GPU clusters) and TRL."""
