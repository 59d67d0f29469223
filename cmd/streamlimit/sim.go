package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newSimCmd is a placeholder until the sim command lands.
func newSimCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "sim",
		Short:  "(not yet available)",
		Hidden: true,
		RunE:   func(*cobra.Command, []string) error { return errors.New("sim: not yet available") },
	}
}
