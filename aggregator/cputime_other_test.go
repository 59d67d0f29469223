//go:build !unix

package aggregator

import "time"

// processCPU returns 0: the platform's process CPU time is not read here.
func processCPU() time.Duration { return 0 }
