"""The RLJob Kubernetes operator (kopf): thin handlers over pure builders.

It depends on `rljob.api` for the contract; install it with `pip install rljob[operator]`.
"""
