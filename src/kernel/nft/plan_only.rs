//! [`PlanOnly`]: an [`Nftables`] client for `--dry-run` that sees an empty kernel and
//! applies nothing, so a proxier can plan a full sync without a socket. Pure.

use super::decode::ListedTable;
use super::{Error, Family, Nftables, Transaction};

/// Lists nothing, applies nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct PlanOnly;

impl Nftables for PlanOnly {
    fn apply(&mut self, _: &Transaction) -> Result<(), Error> {
        Ok(())
    }
    fn list_tables(&mut self, _: Family) -> Result<Vec<ListedTable>, Error> {
        Ok(vec![])
    }
    fn list_chains(&mut self, _: Family, _: &str) -> Result<Vec<String>, Error> {
        Ok(vec![])
    }
    fn list_sets(&mut self, _: Family, _: &str) -> Result<Vec<String>, Error> {
        Ok(vec![])
    }
    fn list_rule_jumps(
        &mut self,
        _: Family,
        _: &str,
    ) -> Result<Vec<super::decode::RuleJumps>, Error> {
        Ok(vec![])
    }
}
