//go:build !unix

package safefile

// oNonblock is 0 where there are no named pipes to open without blocking.
const oNonblock = 0
