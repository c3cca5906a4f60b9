"""The fleet: a store shared by control-plane replicas (election with a lease, versioned
records with compare-and-set, watches), so the loops decide once and their state outlives any
pod. ``file:`` is the embedded one-node default; ``etcd://`` the distributed one."""
