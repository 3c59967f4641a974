pub mod ns;
