"""A registry server over HTTP: the remote backend, its transport, the REST shapes both sides
share, and the credentials and header values that go on the wire."""
