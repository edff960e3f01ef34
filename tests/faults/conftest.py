"""The S3 (moto) and PostgreSQL fixtures of tests/integration, for the fault suite."""

from tests.integration.conftest import (  # noqa: F401  (fixtures, used by name)
    aws_env,
    moto_server,
    pg_database,
    pg_url,
    postgres,
    raw_s3,
    s3_bucket,
    s3_endpoint,
    s3_store_url,
)
