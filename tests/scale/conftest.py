"""The scale-out tests use the session fixtures ``dask_client`` and ``wait_for_two`` of tests/conftest.py
(one LocalCluster of 2 worker processes for the whole run, shared with tests/s3/test_pull_cluster.py)."""
