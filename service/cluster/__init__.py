"""The cluster: replicas that share a database, an object store and a topic.

``leadership`` elects one leader through a lease row in the database; ``logtail``
keeps a replica applying the events other replicas stored, in log order.
"""
