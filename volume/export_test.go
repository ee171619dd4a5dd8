package volume

// PodLocks is how many pods have a lock entry, for tests that check none leaks.
func (m *Manager) PodLocks() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pods)
}
