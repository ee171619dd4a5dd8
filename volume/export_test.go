package volume

import "time"

// PodLocks is how many pods have a lock entry, for tests that check none leaks.
func (m *Manager) PodLocks() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pods)
}

// SetShuffle replaces the random order of merged trust anchors, so tests can
// compare whole files and count merges.
func (c *ClusterTrustBundles) SetShuffle(f func([]string)) { c.shuffle = f }

// SetJitter replaces the random refresh jitter.
func (p *PodCertificateIssuer) SetJitter(d time.Duration) {
	p.jitter = func() time.Duration { return d }
}
