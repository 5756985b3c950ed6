"""Beam's S3 options (endpoint, credentials, region) for worker processes that start without them.

Beam 2.62's local runner in ``multi_processing`` mode (``--workers N``) starts its worker processes
without the pipeline options: their S3 clients are made with no endpoint or credentials, and boto3
then reads its environment variables. :func:`export_to_environment` puts the options there before the
workers start; they inherit the launcher's environment.

Beam's S3 file system makes a boto3 client for every file-system call (``S3FileSystem`` builds
``S3IO(options=...)`` per ``match``, ``open``, ``create``, ``rename``, ``delete``, and ``S3IO`` a new
``boto3.session.Session().client("s3")``); nothing here changes that (docs/deploy.md, "Beam as it is").

Layer 3 (Beam): imports nothing from streameval.
"""

from __future__ import annotations

import os

__all__ = ["ENV_OF_OPTION", "export_to_environment"]

#: an S3 option of Beam -> the environment variable boto3 reads when a client is made without it
ENV_OF_OPTION = {"s3_endpoint_url": "AWS_ENDPOINT_URL_S3", "s3_access_key_id": "AWS_ACCESS_KEY_ID",
                 "s3_secret_access_key": "AWS_SECRET_ACCESS_KEY", "s3_session_token": "AWS_SESSION_TOKEN",
                 "s3_region_name": "AWS_DEFAULT_REGION"}


def export_to_environment(options, environ=None) -> list[str]:
    """Put ``options``' S3 settings (endpoint, credentials, region) in the environment ``environ``
    (default ``os.environ``) as boto3's variables (:data:`ENV_OF_OPTION`), for worker processes that
    start without the pipeline options and inherit the launcher's environment. Returns the names set
    (none when no S3 option is given)."""
    from apache_beam.options.pipeline_options import S3Options

    env = os.environ if environ is None else environ
    s3 = options.view_as(S3Options)
    done = []
    for option, name in ENV_OF_OPTION.items():
        value = getattr(s3, option, None)
        if value:
            env[name] = str(value)
            done.append(name)
    return done
