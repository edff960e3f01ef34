"""Ways out of the registry that speak another system's protocol: ``hf`` (the Hugging Face
Hub's read API, served under ``/hf``) and ``uri`` (``registry://`` URIs materialized into a
folder, the entry point of a KServe storage initializer). The OCI door lives in ``oci/``."""
