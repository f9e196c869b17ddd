package main

import "sort"

// sortEntries orders list rows oldest first (by creation, then task and number).
func sortEntries(out []listEntry) {
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		if out[i].Task != out[j].Task {
			return out[i].Task < out[j].Task
		}
		return out[i].Checkpoint < out[j].Checkpoint
	})
}
