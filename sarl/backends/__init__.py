"""Training back ends: they adapt the backend-free reward objects to verl (GPU clusters) and TRL, each behind the one
interface of `sarl.backends.base` (what it refuses, its dry run, its cheap checks, its launch), named by
`conf/backend/<name>.yaml`'s `impl`."""
