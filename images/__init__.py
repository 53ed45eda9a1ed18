"""Container images of rljob: Dockerfiles, the shared install definition (install.py),
a builder that needs no container engine (build.py) and OCI archive packing (oci.py)."""
