"""Replica sync: proving the mirrored copies of every weight stay equal (`ReplicaSyncCheck`)."""
