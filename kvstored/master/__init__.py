"""The master: the cluster's object table, node table, leases and policies.

It holds metadata only; data never passes through it. Everything it knows can be
rebuilt from the nodes, which re-register what they hold whenever they (re)connect.
"""
