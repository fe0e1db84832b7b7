//! The embedded default [`Store`]: one redb file, `gangway.redb`, under the data directory.
//!
//! redb commits with `Durability::Immediate` (fsync) by default, so [`RedbStore::apply`]
//! returns only once the batch is on disk; a kill -9 right after loses nothing acknowledged.
//! Keys and values are JSON (small, readable with any redb tool, and tolerant of added fields).

use std::path::{Path, PathBuf};

use gangway_core::model::{InstanceKey, ServiceKey};
use gangway_store::{Contents, Store, StoreError, Write};
use redb::{Database, ReadableTable, TableDefinition};

const INSTANCES: TableDefinition<&str, &str> = TableDefinition::new("instances");
const SERVICES: TableDefinition<&str, &str> = TableDefinition::new("services");
const OFFLINE_MARKS: TableDefinition<&str, &str> = TableDefinition::new("offline_marks");

/// File name of the database inside the data directory.
pub const FILE_NAME: &str = "gangway.redb";

/// redb-backed store.
pub struct RedbStore {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("path", &self.path)
            .finish()
    }
}

impl RedbStore {
    /// Opens (creating if needed) `<data_dir>/gangway.redb`, creating `data_dir` too.
    ///
    /// Errors: the directory cannot be created, the file is locked by another process, or it is
    /// not a redb database.
    pub fn open(data_dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| StoreError::Io(format!("cannot create {}: {e}", data_dir.display())))?;
        let path = data_dir.join(FILE_NAME);
        let db = Database::create(&path)
            .map_err(|e| StoreError::Io(format!("cannot open {}: {e}", path.display())))?;
        let store = Self { db, path };
        // Create the tables once so that reads never meet a missing table.
        store.apply(&[])?;
        Ok(store)
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("store types serialise to JSON")
}

fn instance_key(service: &ServiceKey, key: &InstanceKey) -> String {
    json(&(service, key))
}

fn decode<T: serde::de::DeserializeOwned>(table: &'static str, s: &str) -> Result<T, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt {
        table,
        message: e.to_string(),
    })
}

impl Store for RedbStore {
    fn load(&self) -> Result<Contents, StoreError> {
        let tx = self.db.begin_read().map_err(io)?;
        let mut contents = Contents::default();
        let mut batch = Vec::new();
        for row in tx.open_table(INSTANCES).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            let (service, _): (ServiceKey, InstanceKey) = decode("instances", k.value())?;
            batch.push(Write::PutInstance(service, decode("instances", v.value())?));
        }
        for row in tx.open_table(SERVICES).map_err(io)?.iter().map_err(io)? {
            let (k, v) = row.map_err(io)?;
            batch.push(Write::PutService(
                decode("services", k.value())?,
                decode("services", v.value())?,
            ));
        }
        for row in tx
            .open_table(OFFLINE_MARKS)
            .map_err(io)?
            .iter()
            .map_err(io)?
        {
            let (k, v) = row.map_err(io)?;
            let (service, key): (ServiceKey, InstanceKey) = decode("offline_marks", k.value())?;
            batch.push(Write::PutOfflineMark(
                service,
                key,
                decode("offline_marks", v.value())?,
            ));
        }
        contents.apply(&batch);
        Ok(contents)
    }

    fn apply(&self, batch: &[Write]) -> Result<(), StoreError> {
        let tx = self.db.begin_write().map_err(io)?;
        {
            let mut instances = tx.open_table(INSTANCES).map_err(io)?;
            let mut services = tx.open_table(SERVICES).map_err(io)?;
            let mut marks = tx.open_table(OFFLINE_MARKS).map_err(io)?;
            for write in batch {
                match write {
                    Write::PutInstance(s, i) => {
                        instances
                            .insert(instance_key(s, &i.instance.key).as_str(), json(i).as_str())
                            .map_err(io)?;
                    }
                    Write::DeleteInstance(s, k) => {
                        instances.remove(instance_key(s, k).as_str()).map_err(io)?;
                    }
                    Write::PutService(s, v) => {
                        services
                            .insert(json(s).as_str(), json(v).as_str())
                            .map_err(io)?;
                    }
                    Write::DeleteService(s) => {
                        services.remove(json(s).as_str()).map_err(io)?;
                    }
                    Write::PutOfflineMark(s, k, m) => {
                        marks
                            .insert(instance_key(s, k).as_str(), json(m).as_str())
                            .map_err(io)?;
                    }
                    Write::DeleteOfflineMark(s, k) => {
                        marks.remove(instance_key(s, k).as_str()).map_err(io)?;
                    }
                }
            }
        }
        // Dropping the transaction without commit aborts it: all-or-nothing.
        tx.commit().map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redb_store_conforms() {
        let dirs = std::sync::Mutex::new(Vec::new());
        gangway_store::conformance::run(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = RedbStore::open(dir.path()).expect("open");
            dirs.lock().unwrap().push(dir);
            store
        });
    }

    #[test]
    fn contents_survive_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let svc = ServiceKey::named("orders");
        let batch: Vec<Write> = (0..100)
            .map(|n| Write::PutInstance(svc.clone(), gangway_store::conformance::sample(n)))
            .collect();
        {
            let store = RedbStore::open(dir.path()).expect("open");
            store.apply(&batch).expect("apply");
        }
        let reopened = RedbStore::open(dir.path()).expect("reopen");
        let mut expected = Contents::default();
        expected.apply(&batch);
        assert_eq!(reopened.load().expect("load"), expected);
        assert_eq!(expected.instances[&svc].len(), 100);
    }

    #[test]
    fn a_record_written_before_owners_were_stored_loads_unowned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let svc = ServiceKey::named("orders");
        let mut owned = gangway_store::conformance::sample(1);
        owned.owner = Some("alice".into());
        // The record as older versions wrote it: the same JSON without the `owner` field.
        let mut old = serde_json::to_value(&owned).expect("json");
        old.as_object_mut().expect("object").remove("owner");
        let old = old.to_string();
        assert!(!old.contains("owner"), "{old}");
        {
            let store = RedbStore::open(dir.path()).expect("open");
            let tx = store.db.begin_write().expect("write");
            tx.open_table(INSTANCES)
                .expect("table")
                .insert(
                    instance_key(&svc, &owned.instance.key).as_str(),
                    old.as_str(),
                )
                .expect("insert");
            tx.commit().expect("commit");
        }
        let store = RedbStore::open(dir.path()).expect("reopen");
        let loaded = store.load().expect("load");
        let got = &loaded.instances[&svc][&owned.instance.key];
        assert_eq!(got.owner, None);
        assert_eq!(got.instance, owned.instance);
        // Written again with its owner, it keeps it across a reopen.
        store
            .apply(&[Write::PutInstance(svc.clone(), owned.clone())])
            .expect("apply");
        drop(store);
        let reopened = RedbStore::open(dir.path()).expect("reopen");
        assert_eq!(
            reopened.load().expect("load").instances[&svc][&owned.instance.key].owner,
            Some("alice".into())
        );
    }

    #[test]
    fn a_directory_that_is_a_file_is_a_clear_error() {
        let file = tempfile::NamedTempFile::new().expect("file");
        let err = RedbStore::open(file.path()).expect_err("must fail");
        assert!(err.to_string().contains("cannot create"), "{err}");
    }
}
