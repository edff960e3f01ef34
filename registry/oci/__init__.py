"""The OCI door: a version pushed to, and pulled from, any OCI registry as a CNCF ModelPack
artifact whose layer digests are the registry's own blob digests.

    refs.py        oci://HOST[:PORT]/REPO[:TAG|@sha256:] and the plain-HTTP rule
    auth.py        credentials (REGISTRY_OCI_AUTH, docker config) and the 401 dance
    transport.py   OciClient: the distribution spec over httpx
    modelpack.py   the artifact format: layers, config, annotations; reading one back
    push.py        a version -> an artifact (HEAD, mount, chunked parallel uploads)
    pull.py        an artifact -> the verified cache -> the version record it holds
    foreign.py     another producer's artifact -> a checkpoint dir -> a normalized version
    unpack.py      layers laid out as files: raw ones linked, tar ones unpacked safely
    signed.py      a version's signatures as layers, read back as a signature store
    door.py        the three operations the facade calls: push, opened (pull), import
    results.py     OciPush

The room is built with what it needs (a version record, a ``blob_path`` function, settings,
the backend's push for an import) and never sees the Registry facade. This package file loads
nothing, so ``import registry`` does not import httpx.
"""
