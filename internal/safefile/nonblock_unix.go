//go:build unix

package safefile

import "syscall"

// oNonblock keeps the open of a named pipe without a writer from blocking.
const oNonblock = syscall.O_NONBLOCK
