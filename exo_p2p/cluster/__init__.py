"""Cluster formation: heartbeats, liveness, election, log replication over the net layer."""
