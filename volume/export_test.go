package volume

// PodLocks is how many pods have a lock entry, for tests that check none leaks.
func (m *Manager) PodLocks() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pods)
}

// SetShuffle replaces the random order of merged trust anchors, so tests can
// compare whole files and count merges.
func (c *ClusterTrustBundles) SetShuffle(f func([]string)) { c.shuffle = f }
