//! Collate layouts: placeholder until the collate engine lands.
