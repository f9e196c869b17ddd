package bench

import (
	"context"
	"errors"
	"time"

	"github.com/ckpt-io/ckpt/manifests"
)

// HashLoad hashes bytesPerS bytes a second with BLAKE3 (the agent's hash of
// new files in manifest format 2), in slices of 10 ms, until ctx ends, and
// does nothing else. It is the app-throughput section's
// CPU control: run as its own process beside the app, it costs what the
// least work any agent storing content-addressed objects does (every byte
// it ships hashed once, no reading, no writing) costs. A slice it falls
// behind on is dropped, not made up later.
func HashLoad(ctx context.Context, bytesPerS int64) error {
	if bytesPerS <= 0 {
		return errors.New("hash load: want a positive rate in bytes per second")
	}
	const slice = 10 * time.Millisecond
	per := max(bytesPerS/int64(time.Second/slice), 1)
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	h := manifests.NewHasher(manifests.BLAKE3)
	tick := time.NewTicker(slice)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		for n := per; n > 0; {
			k := min(n, int64(len(buf)))
			h.Write(buf[:k])
			n -= k
		}
	}
}
