"""The tools floor: what starts, supervises or demonstrates the service on one machine.

``tools.local`` runs the nodes as processes on 127.0.0.1 and restarts one that dies
(`./run.sh local`); ``tools.demo`` starts them and asks the client's eight queries
(`./run.sh demo`). Nothing in ``pipeline/`` or ``services/`` imports this package.
"""
