package explain

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// Verdict names the case a diagnosis found. The values are stable: tools match on them
// in `-o json` output.
type Verdict string

// Node verdicts.
const (
	NodeHealthy     Verdict = "NodeHealthy"
	NodeNotFound    Verdict = "NodeNotFound"
	KubeletSilent   Verdict = "KubeletSilent"
	NetworkNotReady Verdict = "NetworkNotReady"
	RuntimeDown     Verdict = "RuntimeDown"
	NodePressure    Verdict = "NodePressure"
	NodeNotReady    Verdict = "NodeNotReady"
)

// Service verdicts.
const (
	ServiceHealthy           Verdict = "ServiceHealthy"
	ServiceNotFound          Verdict = "ServiceNotFound"
	ServiceNoEndpoints       Verdict = "NoEndpoints"
	ServiceEndpointsNotReady Verdict = "EndpointsNotReady"
	KubeProxyDown            Verdict = "KubeProxyDown"
	KubeProxyStale           Verdict = "KubeProxyStale"
	RulesDrift               Verdict = "RulesDrift"
)

// Diagnosis is the answer to one explain question.
type Diagnosis struct {
	// Object is "node/NAME" or "service/NS/NAME".
	Object  string  `json:"object"`
	Verdict Verdict `json:"verdict"`
	Healthy bool    `json:"healthy"`
	// Summary is the diagnosis in plain words.
	Summary string `json:"summary"`
	// Evidence lists the facts the summary rests on, most telling first.
	Evidence []string `json:"evidence"`
	// Next lists the commands worth running next, most useful first.
	Next []string `json:"next,omitempty"`
}

// WriteText prints d for a person.
func (d Diagnosis) WriteText(w io.Writer) error {
	state := "healthy"
	if !d.Healthy {
		state = "NOT healthy"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s (%s)\n\n%s\n", d.Object, d.Verdict, state, d.Summary)
	if len(d.Evidence) > 0 {
		b.WriteString("\nEvidence:\n")
		for _, e := range d.Evidence {
			fmt.Fprintf(&b, "  - %s\n", e)
		}
	}
	if len(d.Next) > 0 {
		b.WriteString("\nNext:\n")
		for _, n := range d.Next {
			fmt.Fprintf(&b, "  $ %s\n", n)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints d as one indented JSON object.
func (d Diagnosis) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(d)
}

// ago renders the time between then and now for people: "1m23s ago", "10.3s ago".
func ago(now, then time.Time) string {
	return human(now.Sub(then)) + " ago"
}

func human(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		// A tenth of a second keeps "10.3s ago, longer than the 10s grace period" honest.
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}
