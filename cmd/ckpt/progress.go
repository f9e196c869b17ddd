package main

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ckpt-io/ckpt/internal/human"
)

// progress draws a one-line bar (bytes, rate, ETA) on stderr when stderr is
// a terminal; otherwise, and in --json mode, it draws nothing.
type progress struct {
	on    bool
	label string
	start time.Time
	mu    sync.Mutex
	last  time.Time
	drawn bool
}

func newProgress(wanted bool, label string) *progress {
	return &progress{on: wanted && isTerminal(os.Stderr), label: label, start: time.Now()}
}

// update is called from many goroutines as bytes land.
func (p *progress) update(done, total int64) {
	if p == nil || !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if now.Sub(p.last) < 100*time.Millisecond && done < total {
		return
	}
	p.last, p.drawn = now, true
	el := now.Sub(p.start).Seconds()
	rate := float64(done) / max(el, 1e-3)
	frac := 1.0
	if total > 0 {
		frac = float64(done) / float64(total)
	}
	eta := "--"
	if rate > 0 && total > done {
		eta = (time.Duration(float64(total-done)/rate) * time.Second / time.Second).Round(time.Second).String()
	}
	const width = 30
	n := int(frac * width)
	fmt.Fprintf(os.Stderr, "\r%s [%s%s] %5.1f%% %s/%s %s/s ETA %s  ", p.label, strings.Repeat("=", n), strings.Repeat(" ", width-n),
		frac*100, human.Bytes(done), human.Bytes(total), human.Bytes(int64(rate)), eta)
}

// done ends the bar's line.
func (p *progress) done() {
	if p != nil && p.on && p.drawn {
		fmt.Fprintln(os.Stderr)
	}
}
