"""Download engines: ``sync``/``threads``/``ranged`` (boto3 threads), ``async`` (aioboto3), ``processes``."""
