"""Pointsman's collector: scrapes every model-server pod and publishes the pool's state to Redis.

Layout: ``http1`` (the sans-IO response parser) → ``httpclient`` (keep-alive GETs) → ``scrape`` (one
pod's page) → ``normalize`` (pure merge and health rules) → ``loop`` (a task per pod, the pool state, the
publisher) → ``sink`` (Redis); ``topology`` (whether the pool is shared) and ``sharing`` (the replicas'
split); ``metrics`` and ``app`` expose it; ``__main__`` wires it from the config file.
"""
