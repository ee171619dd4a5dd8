package lease

import "time"

// Metrics receives the heartbeat's health. Methods are called from the renewing
// goroutine only and must not block. Agents adapt it to Prometheus; nil in Config
// means no metrics.
type Metrics interface {
	// RenewLatency observes one successful write of the lease (Create or Update):
	// the time from sending the request to its answer.
	RenewLatency(d time.Duration)
	// RenewFailure counts one failed API call on the lease or its owner; op is
	// "get", "create", "update" or "owner".
	RenewFailure(op string)
	// ConsecutiveFailures reports how many API calls have failed since the last
	// successful write; it is reported after every call, so 0 follows a success.
	ConsecutiveFailures(n int)
}

type noMetrics struct{}

func (noMetrics) RenewLatency(time.Duration) {}
func (noMetrics) RenewFailure(string)        {}
func (noMetrics) ConsecutiveFailures(int)    {}
