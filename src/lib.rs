pub fn x(){}
pub mod mock;
pub mod phone;
pub mod provider;
