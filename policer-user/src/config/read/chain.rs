//! `[[chain]]` tables (crate::chain::ChainConfig): each key's type, then
//! the table's own checks (`ChainConfig::check`).

use toml::{Spanned, de::DeValue};

use super::{
    super::schema::{self, ChainField, Field, Table},
    Reader, TableOrigin, unsigned,
};
use crate::chain::ChainConfig;

impl Reader {
    /// One `[[chain]]`: the table when every key is valid; each problem
    /// otherwise.
    pub(super) fn chain(&mut self, origin: TableOrigin, item: &Spanned<DeValue<'_>>) -> Option<ChainConfig> {
        const WRITE: &str = "[[chain]] with interface = \"eth0\", slot = 0 and object = \"filter.o\"";
        let head = format!("chain {}", origin.number);
        let t = self.table(&head, item, WRITE)?;
        let mut c = ChainConfig::default();
        let mut ok = true;
        let mut slot = false;
        for (k, v) in t.iter() {
            let key = &**k.get_ref();
            let Some(Field::Chain(field)) = schema::find(Table::Chain, key).map(|k| k.field) else {
                self.unknown_key(k.span(), &head, "a chain table's", key, Table::Chain);
                ok = false;
                continue;
            };
            let at = Some(self.line(v.span()));
            let text = match v.get_ref() {
                DeValue::String(s) if !s.is_empty() && !s.contains('\0') => Some(s.to_string()),
                _ => None,
            };
            let good = match field {
                ChainField::Slot => match unsigned(v.get_ref(), u64::from(u32::MAX)) {
                    Some(n) => {
                        c.slot = n as u32;
                        slot = true;
                        true
                    }
                    None => false,
                },
                ChainField::Interface => text.clone().map(|s| c.interface = s).is_some(),
                ChainField::Object => text.clone().map(|s| c.object = Some(s)).is_some(),
                ChainField::Program => text.clone().map(|s| c.program = Some(s)).is_some(),
                ChainField::PinMaps => text.clone().map(|s| c.pin_maps = Some(s)).is_some(),
                ChainField::Pinned => text.clone().map(|s| c.pinned = Some(s)).is_some(),
            };
            if !good {
                let is = if field == ChainField::Slot { "a slot number" } else { "a name or path" };
                self.push(at, format!("{head}: {key} is not {is}; write {WRITE}"));
                ok = false;
            }
        }
        if !slot && ok {
            self.push(origin.line, format!("{head}: needs a slot, 0 to 7; write {WRITE}"));
            return None;
        }
        if ok && let Err(e) = c.check() {
            self.push(origin.line, format!("{head}: {e}"));
            return None;
        }
        ok.then_some(c)
    }
}
