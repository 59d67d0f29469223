package main

import (
	"errors"

	"github.com/spf13/cobra"
)

// newEnforcerCmd is a placeholder until the enforcer command lands.
func newEnforcerCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "enforcer",
		Short:  "(not yet available)",
		Hidden: true,
		RunE:   func(*cobra.Command, []string) error { return errors.New("enforcer: not yet available") },
	}
}
